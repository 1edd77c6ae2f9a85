// The Talk view's microphone tap (an AudioWorklet, on the audio thread): the context's rate (44.1 or 48 kHz) down
// to the realtime session's PCM16 24 kHz mono, posted in 100 ms blocks. Each output sample is the mean of the input
// samples it covers (a box filter: enough against aliasing for a voice that whisper hears at 16 kHz).

const OUT_RATE = 24000;
const BLOCK = OUT_RATE / 10; // samples per message: 100 ms

class TalkCapture extends AudioWorkletProcessor {
  constructor() {
    super();
    this.step = sampleRate / OUT_RATE; // input samples per output sample
    this.edge = this.step; // where, in input samples from the current one, the output sample being built ends
    this.sum = 0;
    this.count = 0;
    this.block = new Int16Array(BLOCK);
    this.filled = 0;
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (!channel) return true; // no input yet (or the track ended): keep the node alive until it is disconnected
    for (let i = 0; i < channel.length; i += 1) {
      this.sum += channel[i];
      this.count += 1;
      this.edge -= 1;
      if (this.edge > 0) continue;
      const mean = Math.max(-1, Math.min(1, this.sum / this.count));
      this.sum = 0;
      this.count = 0;
      // A capture rate under 24 kHz (a headset's 16 kHz) holds each input sample for as many outputs as it covers.
      while (this.edge <= 0) {
        this.emit(mean < 0 ? mean * 0x8000 : mean * 0x7fff);
        this.edge += this.step;
      }
    }
    return true;
  }

  emit(sample) {
    this.block[this.filled] = sample;
    this.filled += 1;
    if (this.filled === BLOCK) {
      this.port.postMessage(this.block.buffer, [this.block.buffer]);
      this.block = new Int16Array(BLOCK);
      this.filled = 0;
    }
  }
}

registerProcessor("blazar-talk-capture", TalkCapture);
